"""RL: pure PPO math, the sharded learner, the asynchronous loop."""
