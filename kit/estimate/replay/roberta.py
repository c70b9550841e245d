"""RoBERTa: ``transformers.models.roberta.modeling_roberta.RobertaLayer`` (BERT's layer, copied: :func:`.bert.layer`).

The embeddings differ from BERT's in their ids: the position ids are made from the input ids
(``create_position_ids_from_input_ids``: a (B, S) int64 the position embedding keeps) and the token types are
gathered by them (another (B, S) int64, kept by the token-type embedding): the ``id_rows`` mark. The sequence
classifier is ``RobertaClassificationHead`` (:mod:`.task_heads`): dropout on the first token, dense, tanh,
dropout, ``out_proj``; no pooler.
"""
from __future__ import annotations

from kit.estimate.replay import bert
from kit.estimate.replay.setup import Covers, around
from kit.estimate.replay.tape import Tape


@around(covers=Covers(blocks=("RobertaLayer",),
                      attention=("RobertaAttention", "RobertaSelfAttention", "RobertaSelfOutput"),
                      mlp=("RobertaIntermediate", "RobertaOutput")),
        final_norm=None, embd_dropout=True, embed_norm=True, encoder="roberta", id_rows=2)
def block(tp: Tape, x):
    return bert.layer(tp, x)
