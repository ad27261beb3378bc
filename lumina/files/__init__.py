"""Where files live (local paths or fsspec URLs) and output directories that are never overwritten or mixed."""
