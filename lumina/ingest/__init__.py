"""The bodies of the `lumina-data` commands: manifests and image folders -> Parquet shards, pixel encoding,
fitting the built-in image tokenizer."""
