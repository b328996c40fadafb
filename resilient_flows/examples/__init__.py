"""Example stages and workloads that workflow files in ``workflows/`` name by ``module:function``."""
