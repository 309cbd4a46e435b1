"""Model card templates, one per architecture (installed as ``tf_family.model_cards``)."""
