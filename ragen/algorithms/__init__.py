"""ragen.algorithms"""
