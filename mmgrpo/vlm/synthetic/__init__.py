"""Synthetic benchmarks of the VLM front-end, with exactly known ground truth, written in its canonical JSONL
(:mod:`mmgrpo.vlm.data`): ``tvg`` (videos of moving shapes with known event spans, temporal grounding; version 1),
``grounding`` (its multi-event variant with distractors and motion queries; version 2) and ``cli`` (``python
data/synthetic_tvg.py``). Their shapes come from :mod:`mmgrpo.synthetic.shapes`, shared with the text-to-video
benchmark. ``look_again`` and ``think_or_not`` hold the VLM side (tool, SFT traces, evaluation) of the image benchmarks
of the same names in :mod:`mmgrpo.synthetic`.
"""
