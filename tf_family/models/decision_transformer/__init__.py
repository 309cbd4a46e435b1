"""Decision Transformer: what the architecture declares about itself (its `ArchSpec`, read by `tf_family.registry`)."""

from types import MappingProxyType

from ...spec import ArchSpec

SPEC = ArchSpec(
    name="decision_transformer",
    title="Decision Transformer (Chen et al. 2021)",
    model_type="tff_decision_transformer",
    config="tf_family.models.decision_transformer.configuration_decision_transformer:TffDecisionTransformerConfig",
    models=MappingProxyType(
        {"action": "tf_family.models.decision_transformer.modeling_decision_transformer:TffDecisionTransformerModel"}
    ),
    variants=MappingProxyType(
        {
            "tiny": MappingProxyType(
                {
                    "state_dim": 5,
                    "act_dim": 3,
                    "context_length": 8,
                    "max_ep_len": 64,
                    "hidden_size": 32,
                    "n_layer": 2,
                    "n_head": 2,
                    "resid_pdrop": 0.0,
                    "embd_pdrop": 0.0,
                    "attn_pdrop": 0.0,
                    # the auxiliary heads are on (and trained) so that the tests reach every parameter
                    "predict_state": True,
                    "predict_return": True,
                    "state_loss_weight": 0.5,
                    "return_loss_weight": 0.5,
                }
            ),
            # LunarLander-v3 from tf_family.data.offline_rl: 8-d states, 4 discrete actions, 1000-step episodes
            "small": MappingProxyType(
                {
                    "state_dim": 8,
                    "act_dim": 4,
                    "action_space": "discrete",
                    "action_tanh": False,
                    "context_length": 20,
                    "max_ep_len": 1000,
                    "hidden_size": 128,
                    "n_layer": 3,
                    "n_head": 1,
                    "return_scale": 100.0,
                    "env_id": "LunarLander-v3",
                }
            ),
            # the shape of edbeeching/decision-transformer-gym-hopper-* (transformers' checkpoints)
            "hopper": MappingProxyType(
                {
                    "state_dim": 11,
                    "act_dim": 3,
                    "max_ep_len": 1000,
                    "hidden_size": 128,
                    "n_layer": 3,
                    "n_head": 1,
                    "predict_state": True,
                    "predict_return": True,
                    "return_scale": 1000.0,
                    "target_return": 3600.0,
                    "env_id": "Hopper-v5",
                }
            ),
        }
    ),
    lora_target_modules=("qkv", "out_proj", "fc_in", "fc_out"),
    ia3_target_modules=("qkv", "fc_out"),
    ia3_feedforward_modules=("fc_out",),
    exports=(
        "tf_family.models.decision_transformer.modeling_decision_transformer:TffDecisionTransformerPreTrainedModel",
        "tf_family.models.decision_transformer.modeling_decision_transformer:TrajectoryContext",
    ),
    options=(("GTrXL blocks (Parisotto et al. 2020)", 'gating="gru"'),),
    reference="transformers 5 DecisionTransformerModel (installed)",
    parity="state/action/return predictions within 1e-5 (random tiny model, converted folder)",
    card="decision_transformer.md",
    paper="2106.01345",
    foreign=("tf_family.models.decision_transformer.convert_decision_transformer:TRANSFORMERS_DECISION_TRANSFORMER",),
)

__all__ = ["SPEC"]
