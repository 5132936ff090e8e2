"""A LLaMA pre-trained with FOAM in Flax NNX: the example and the benchmarks' model.

Modules, one idea each:

* ``configs``: ``LlamaConfig``, the presets (``tiny`` ... ``7b``), ``get_config``.
* ``model``: the ``Llama`` module and ``abstract_params`` (``nnx.eval_shape``).
* ``tokenizers``, ``data``: bytes or SentencePiece; corpora and seeded windows.
* ``optimizers``: the one optimizer registry (``make_optimizer(name, ...)``).
* ``sharding``: meshes from ``--mesh fsdp=2,tp=4`` and the state's shardings.
* ``state``: the model and its ``nnx.Optimizer`` on a mesh, or abstract.
* ``steps``: the loss and the jitted train and eval steps.
* ``checkpoints``: Orbax save and restore.
* ``outputs``: ``config.json``, ``metrics.jsonl``, ``loss.png``, the machine.
* ``train_config``: ``TrainConfig`` and the flags generated from it.
* ``trainer``: the run in named steps; ``train.py``: the command line.
* ``generate``: text from a trained model.
"""
