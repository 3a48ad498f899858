"""Synthetic RAW shots with known ground truth: unprocessing (``unprocess``), single shots and stacks (``synth``),
the stack benchmark's scenes (``stack_synth``)."""
