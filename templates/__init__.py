"""C templates for micrograd-c's generated modules (package data: module.c)."""
