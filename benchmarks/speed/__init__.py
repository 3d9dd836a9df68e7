"""Speed and footprint measurements, each a command of its own writing to results/."""
