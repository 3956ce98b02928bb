"""The spec, its compilation into Prefect flows, and the `tandem` CLI."""
