"""Adapters that make other training frameworks checkpoint and stop through resilient-flows.

Each adapter lives in its own module and imports its framework there, so that importing this
package costs nothing and the frameworks stay optional extras:

- :mod:`resilient_flows.integrations.lightning`: a PyTorch Lightning ``CheckpointIO`` plugin and
  callback (``pip install 'resilient-flows[lightning]'``);
- :mod:`resilient_flows.integrations.transformers`: a Hugging Face ``Trainer`` helper,
  ``resilient_trainer`` (``pip install 'resilient-flows[transformers]'``);
- :mod:`resilient_flows.integrations.pathstore`: checkpoints named by file paths, as frameworks
  name them, on top of the engine's step-addressed tiers (used by the adapters).
"""
