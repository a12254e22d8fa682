"""Program + model -> Result: hooks on the events the graph names, statements run when those fire."""
