"""The proof of an artifact: the reference the export validated against, stored in the artifact
(`stored.py`), the rules that judge a graph's results against it (`judge.py`, the export's and the
deployed check's alike), and `validate()` (`check.py`), which runs the stored calls through an OpenVINO
consumer on a device (`consumers.py`) wherever the artifact was copied to."""
