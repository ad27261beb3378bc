"""`python -m lumina.train [overrides]`: the same as `lumina-train`."""

from lumina.cli.train import main

if __name__ == "__main__":
    main()
