"""Writing the C of a lowered program: element types, optimizers, the kernel table, statements, loop nests and the sources."""
