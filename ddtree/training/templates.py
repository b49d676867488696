"""Instruction templates and topics for the drafter's training prompts.

Written for this project; none is taken from a benchmark (HumanEval, spec-bench, Alpaca,
MT-Bench, GSM8K). Each template takes named fields filled by `ddtree.training.prompts`.
"""

from __future__ import annotations

# {stub}: a function signature + docstring from a Python source file.
IMPLEMENT = (
    "Implement this Python function:\n\n```python\n{stub}\n```",
    "Write the body of the following function.\n\n```python\n{stub}\n```",
    "Fill in the implementation so that the function does what its docstring says.\n\n"
    "```python\n{stub}\n```",
    "{stub}\n\nWrite this function in Python.",
    "Here is a function signature with a docstring:\n\n```python\n{stub}\n```\n\n"
    "Give a correct and readable implementation.",
)

# {name}: a function name; {summary}: the first line of its docstring.
WRITE_FUNCTION = (
    "Write a Python function `{name}`: {summary}",
    "In Python, write a function named {name}. What it should do: {summary}",
    "Create a small Python function called `{name}` with this behaviour: {summary} "
    "Include a short example of calling it.",
)

# {code}: a chunk of Python source.
CODE = (
    "Continue this Python code:\n\n```python\n{code}\n```",
    "What does this code do?\n\n```python\n{code}\n```",
    "Explain the following Python code step by step.\n\n```python\n{code}\n```",
    "Add helpful comments to this code.\n\n```python\n{code}\n```",
    "Review this Python code and point out possible problems.\n\n```python\n{code}\n```",
    "Rewrite this code to make it easier to read.\n\n```python\n{code}\n```",
)

# {module}: a standard-library module; {qualname}: module.function; {summary}: a docstring
# line; {doc}: a whole (short) docstring.
MODULE = (
    "Explain what the Python function `{qualname}` does.",
    "Write a short example using the Python module `{module}`.",
    "What is the `{module}` module in Python's standard library used for?",
    "Show how to call `{qualname}` and explain its arguments.",
    "When would I use `{qualname}` in a Python program?",
    "Here is the documentation of `{qualname}`:\n\n{doc}\n\nExplain it in plain words.",
    "The docstring of `{qualname}` says: \"{summary}\" Give an example that shows this.",
)

# {text}: a paragraph of documentation prose.
DOCS = (
    "Explain this passage from the Python documentation in simple terms:\n\n{text}",
    "Summarise the following text in two or three sentences.\n\n{text}",
    "Write three questions a student might ask about this text, and answer them.\n\n{text}",
    "Rewrite this paragraph for a beginner programmer.\n\n{text}",
    "{text}\n\nWhat is the main point of the paragraph above?",
    "Summarize the following text in a few sentences.\n\n{text}",
    "Read the passage and answer the question.\n\nPassage: {text}\n\nQuestion: What is "
    "the passage mainly about, and what does it recommend?",
    "{text}\n\nIn one sentence, what does this describe?",
    "Write a short headline and a two-sentence summary for this text.\n\n{text}",
    "Answer from the text only: what problem does it address?\n\n{text}",
)

# {text}: a fortune-cookie saying or a jargon-file entry.
SAYING = (
    "What does this saying mean?\n\n{text}",
    "Explain the humour in this:\n\n{text}",
    "Write a short story inspired by this quote:\n\n{text}",
    "{text}\n\nDo you agree? Explain briefly.",
)

# {topic}, {other}: everyday topics, so the drafter also sees general chat answers.
CHAT = (
    "Write a short poem about {topic}.",
    "Give me three practical tips about {topic}.",
    "Explain {topic} to a ten-year-old.",
    "What are the pros and cons of {topic}?",
    "Write a friendly email to a colleague about {topic}.",
    "List five interesting facts about {topic}.",
    "Write a haiku about {topic}.",
    "Describe {topic} in one paragraph.",
    "Write a very short story that involves {topic}.",
    "How would you compare {topic} and {other}?",
    "Give a one-sentence definition of {topic}.",
    "Write a product description for something related to {topic}.",
    "Create a simple plan for a weekend about {topic}.",
    "What are common mistakes beginners make with {topic}?",
    "Write a dialogue between two friends talking about {topic}.",
    "Summarise the history of {topic} in a few sentences.",
    "Suggest a title and an outline for a blog post on {topic}.",
    "Why do people care about {topic}?",
    "What is the origin of {topic}?",
    "Write a short speech to open an event about {topic}.",
    "Give me a quiz of three questions about {topic}, with answers.",
    "What would a beginner's guide to {topic} cover?",
    "Write a limerick about {topic}.",
    "Describe a typical day of someone who works with {topic}.",
    "What are three myths about {topic}, and what is the truth?",
    "Write a short news report about a surprising discovery in {topic}.",
    "How has {topic} changed over the last hundred years?",
    "Write a motivational message for someone interested in {topic}.",
    "Explain how {topic} relates to {other}.",
    "Write a short review of a book about {topic}.",
)

# Appended to a CHAT prompt ("" = as is): the same question in several answer styles.
STYLES = (
    "", " Keep it short.", " Use bullet points.", " Answer in a friendly tone.",
    " Explain your reasoning.", " Write about 100 words.", " Be specific.",
)

# {a}, {b}, {c}: small integers; arithmetic word problems written for this project.
MATH = (
    "What is {a} multiplied by {b}? Show your working.",
    "A box holds {a} pencils. How many pencils are in {b} boxes?",
    "Solve for x: {a}x + {b} = {c}. Explain each step.",
    "A cyclist rides {a} km in {b} hours. What is the average speed?",
    "I have {c} apples and give away {a}. How many are left?",
    "What is {a} percent of {c}?",
    "A recipe needs {a} eggs for {b} people. How many eggs for {c} people?",
    "Is {c} a prime number? Explain how you can tell.",
)

TOPICS = (
    "gardening", "coffee", "public libraries", "rainy days", "bicycles", "volcanoes",
    "the moon", "learning a language", "chess", "bread baking", "recycling", "trains",
    "honeybees", "time management", "mountains", "the ocean", "friendship", "music lessons",
    "electric cars", "photography", "board games", "healthy breakfasts", "sleep",
    "running", "museums", "cats", "dogs", "winter", "spring cleaning", "budgeting",
    "job interviews", "teamwork", "public speaking", "rivers", "deserts", "robots",
    "solar power", "wind turbines", "the internet", "email etiquette", "camping",
    "birdwatching", "knitting", "painting", "poetry", "football", "swimming", "tea",
    "city parks", "airports", "bridges", "clocks", "maps", "lighthouses", "rain forests",
    "glaciers", "the human heart", "vaccines", "dinosaurs", "fossils", "stars", "comets",
    "black holes", "magnets", "electricity", "photosynthesis", "the water cycle",
    "earthquakes", "weather forecasts", "ancient Rome", "the printing press",
    "the telephone", "databases", "spreadsheets", "passwords", "open source software",
    "version control", "unit tests", "code reviews", "keyboards", "smartphones",
    "online shopping", "cooking pasta", "soup", "vegetables", "chocolate", "picnics",
    "birthdays", "weddings", "moving house", "houseplants", "bees and flowers",
    "volunteering", "saving energy", "walking meetings", "remote work", "note taking",
    "reading habits", "podcasts", "movies", "theatre", "jazz", "the piano", "origami",
    "tides", "owls", "whales", "coral reefs", "forests", "wetlands", "snow", "thunderstorms",
    "rainbows", "the sun", "planets", "satellites", "rockets", "telescopes", "microscopes",
    "bacteria", "the immune system", "nutrition", "hydration", "stretching", "yoga",
    "meditation", "hiking", "sailing", "kayaking", "skiing", "tennis", "basketball",
    "the Olympic games", "marathons", "street food", "spices", "rice", "cheese",
    "fermentation", "coffee shops", "farmers markets", "bakeries", "restaurants",
    "table manners", "letter writing", "handwriting", "calligraphy", "typewriters",
    "newspapers", "radio", "television", "video games", "puzzles", "magic tricks",
    "circuses", "zoos", "aquariums", "national parks", "castles", "pyramids",
    "ancient Egypt", "the Renaissance", "the industrial revolution", "steam engines",
    "canals", "ports", "shipping containers", "supply chains", "small businesses",
    "negotiation", "leadership", "mentoring", "feedback", "meetings", "deadlines",
    "habits", "motivation", "curiosity", "kindness", "patience", "gratitude",
    "neighbours", "grandparents", "siblings", "pets", "parenting", "homework",
    "exams", "universities", "scholarships", "apprenticeships", "career changes",
    "retirement", "insurance", "taxes", "interest rates", "inflation", "cryptography",
    "compilers", "operating systems", "computer networks", "cloud computing",
    "machine learning", "recursion", "sorting algorithms", "hash tables",
    "regular expressions", "APIs", "web browsers", "accessibility", "user interfaces",
)
