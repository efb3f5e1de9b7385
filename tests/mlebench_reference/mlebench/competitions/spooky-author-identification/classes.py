CLASSES = ["EAP", "HPL", "MWS"]
