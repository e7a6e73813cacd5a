"""Drafter architectures, their losses and export key maps: plain nn.Modules, no imports of ours."""
