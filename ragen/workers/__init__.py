"""ragen.workers"""
