"""Training of the learned enhancement model (see training/train.py)."""
