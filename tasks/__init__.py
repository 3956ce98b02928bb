"""Work that runs beside the learner: actors and environments on Dask, the buffer,
weight publishing and checkpoints. Imports `learner`, never `flows`."""
