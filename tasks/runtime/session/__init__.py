"""The learner session and its parts: what runs in a learner process, from the spec's
parts built (`build`) to the last step (`session`): the learner, the weights it publishes,
the stop rule and its watches, the multi-host lockstep; and the failures no retry mends."""
