"""A model's costs per unit, from its sizes alone (nothing built, nothing measured): parameters, forward FLOPs
and activation bytes. `units` holds the arithmetic and ViT and BERT, `hf_families` the other Hugging Face
families from their config.json, `from_config` the model a config would build (`costs_from_config`).

They sit below the layout: the launcher sizes `pipe.length=auto` from them (`ptrun.layout.fill`), and the
simulator (`ptrun.sim`) prices its plans with them."""
