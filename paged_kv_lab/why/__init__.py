"""The why-answers: each decision of a recorded run explained from the events it left."""
