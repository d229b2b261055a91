"""``python -m slimrag``: the same command as ``slimrag``, for environments without the script on PATH."""

from slimrag.cli import main

if __name__ == "__main__":
    main()
