"""The learner: policy model, objectives, batching and the sharded train step.

Pure JAX/Flax; knows nothing of Prefect or Dask.
"""
