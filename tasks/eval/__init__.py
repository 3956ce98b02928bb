"""Evaluation of a version on held-out prompts: the prompts, playing them on a Dask
worker, the scores, and the Prefect task that records them."""
