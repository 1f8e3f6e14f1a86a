"""This machine: child processes, files, locks, git, the cache on disk and its layout."""
