"""What a run keeps: its checkpoints (`checkpoints`), what each holds and how a session saves
and restores it (`run_state`), and a version's weights read after the fact (`version_weights`:
`tandem eval`, `tandem export`)."""
