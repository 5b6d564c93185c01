"""Reading the user's Value graph and lowering it: the program, its groups and loop nests, the batch axis (the IR)."""
