"""Batches: sets of shots rendered together inside a time window, admitted fairly into the batch lane."""
