"""ragen.agent"""
