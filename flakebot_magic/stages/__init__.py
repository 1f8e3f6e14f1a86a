"""The pipeline's stages, one module each: search, fork, build, flake, deploy, client."""
