"""Language models: tasks written as YAML (a prompt template, a target, generation or
multiple choice, a scorer), the model spec (``hf/<path or Hub id>[@revision]``) and the
transformers runtime that warm workers run them on."""
