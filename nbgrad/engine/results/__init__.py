"""What a run hands back: a cell's `Result` and a `cache(...)`'s `Cache`. Neither runs anything: the panels,
exports, datasets and remote cells read them."""
