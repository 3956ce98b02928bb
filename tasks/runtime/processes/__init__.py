"""The processes around a session: the Prefect learner task (`task`) and what it records
(`task_records`), the learner processes it starts on this machine (`hosts`) or on a Dask
cluster (`learner_cluster`, `learner_host`), their events relayed to it (`relay`), and the
signals that stop them (`interrupt`)."""
