"""The backends, building C and loading it: the compilers' table, the build cache, the loaders, cross builds for other machines."""
