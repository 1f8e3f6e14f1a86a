"""What flakebot keeps about tools and runs: the tool inventory, run logs, provenance, steering, sessions."""
