"""Strata's lab: benchmarks and synthetic data, built on the domain package ``services`` (which never imports lab).

``lab.bench`` (speed benchmarks), ``lab.quality`` (image-quality benchmarks), ``lab.synth`` (synthetic shots).
"""
