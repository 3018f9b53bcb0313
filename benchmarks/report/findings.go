package main

// findings are the conclusions drawn from profiles of these benchmarks;
// they explain the tables rather than restate them.
var findings = []string{
	"TODO",
}
