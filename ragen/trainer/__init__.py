"""ragen.trainer"""
