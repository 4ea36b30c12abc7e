"""Reading specs: presets, YAML files and Hugging Face config.json files into specs, with one-line
errors for bad input.
"""
