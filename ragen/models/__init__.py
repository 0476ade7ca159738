"""ragen.models"""
