"""Image-quality benchmarks: held-out synthetic shots with known ground truth through the real render path."""
