"""ragen.utils"""
