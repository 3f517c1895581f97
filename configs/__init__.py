"""The configs the README and the commands' --help name (configs/train.toml, configs/node.toml,
the systemd units, slurm/), shipped with troupe as ``troupe.configs``: ``troupe configs`` lists
them and ``troupe configs NAME`` writes one out, so an install without the repository has them.
A package only so that an editable install finds it as the wheel's does; it holds no code."""
