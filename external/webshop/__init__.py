"""Converts the full WebShop data files into a catalog folder ``ragen.env.webshop`` serves from disk (README.md).

``python -m ragen_external.webshop.convert --items items_shuffle.json --attrs items_ins_v2.json --human
items_human_ins.json --out DIR``; then ``env.config.data_dir=DIR``."""
