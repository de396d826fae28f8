"""Quantization calibrated on what the graph really runs: both stages of a dynamic graph (`both_stages`),
the calls of a static one (`static`), on shared machinery (`calibration`)."""
