"""The material tools/drafter/prompts.py combines into training conversations: topics,
code tasks, comparisons, how-tos, passages to summarise and short exchanges whose
assistant turns are written here. Plain data; the held-out prompts are elsewhere
(bench/heldout_prompts.json) and share none of these templates."""

# lists of short items, packed by hand to keep the file short
# fmt: off
TOPICS = [
    'photosynthesis', 'black holes', 'the French Revolution', 'volcanoes', 'the immune system',
    'machine learning', 'the stock market', 'climate change', 'the Roman Empire', 'jazz music',
    'the water cycle', 'electric cars', 'honeybees', 'the printing press', 'plate tectonics',
    'vaccines', 'the internet', 'coffee', 'the Great Wall of China', 'quantum computing',
    'the human heart', 'renewable energy', 'the Olympic Games', 'chess', 'the Moon landing', 'DNA',
    'inflation', 'rainforests', 'the Renaissance', 'sleep', 'octopuses', 'gravity',
    'the Silk Road', 'bread baking', 'meditation', 'earthquakes', 'the theory of evolution',
    'blockchain', 'the Amazon river', 'antibiotics', 'the Industrial Revolution', 'tea',
    'solar panels', 'the periodic table', 'dinosaurs', 'the ancient Egyptians', 'recycling',
    'the human brain', 'hurricanes', 'origami', 'the Cold War', 'coral reefs', 'marathons',
    'cryptography', 'the Beatles', 'glaciers', 'microplastics', 'public libraries', 'wolves',
    'the speed of light', 'compound interest', 'the Mars rovers', 'yoga', 'the Vikings',
    'composting', '3D printing', 'the ozone layer', 'impressionist painting', 'tsunamis',
    'the Byzantine Empire', 'penguins', 'nuclear fusion', 'the metric system', 'wine making',
    'the Hubble telescope', 'bicycles', 'the Mongol Empire', 'mushrooms', 'time zones',
    'social media', 'the Pyramids of Giza', 'rainbows', 'artificial intelligence ethics',
    'the Magna Carta', 'sharks', 'the human skeleton', 'open source software', 'cheese',
    'the Eiffel Tower', 'migration of birds', 'the Great Depression', 'lightning', 'the violin',
    'supply and demand', 'the Sahara desert', 'origami cranes', 'elephants', 'the Apollo program',
    'baking soda', 'the Dead Sea', 'video games', 'the Pacific Ocean',
]

QUESTION_STYLES = [
    'What is {t}?', 'Tell me about {t}.', 'Why is {t} important?',
    'Give me three interesting facts about {t}.', 'Explain {t} to a ten-year-old.',
    'What are the main pros and cons of {t}?', 'How does {t} work?',
    'Write a short poem about {t}.', 'Describe {t} in one paragraph.',
    'What should a beginner know about {t}?', 'What is the history of {t}?',
    'Can you summarize what scientists know about {t}?', 'What are common myths about {t}?',
    'Write a haiku about {t}.', 'Give me a quick overview of {t}.',
    'What are five questions I could ask about {t} in a quiz, with answers?',
    'How would you explain {t} to someone from the 1800s?',
    'What is the most surprising thing about {t}?',
]

SYSTEM_PROMPTS = [
    'You are a concise assistant. Answer briefly.',
    'You are a friendly tutor who explains things step by step.',
    'You are an expert software engineer.', 'You answer in a cheerful, upbeat tone.',
    'You are a careful assistant who gives practical advice.',
]

LANGUAGES = [
    'Python', 'JavaScript', 'C', 'C++', 'Rust', 'Go', 'Java', 'TypeScript', 'Bash',
]

CODE_TASKS = [
    'reverses a string', 'checks whether a number is prime', 'computes the nth Fibonacci number',
    'sorts a list of numbers with merge sort', 'finds the largest element in an array',
    'counts the words in a text file', 'removes duplicates from a list',
    'checks if a string is a palindrome', 'converts Celsius to Fahrenheit',
    'reads a CSV file and prints each row', 'computes the factorial of a number',
    'implements binary search', 'merges two sorted lists', 'flattens a nested list',
    'counts how often each character appears in a string', 'validates an email address',
    'implements a stack with push and pop', 'computes the greatest common divisor of two numbers',
    'generates a random password', 'finds all even numbers in a list', 'reverses a linked list',
    'checks whether two strings are anagrams', 'computes the average of a list of numbers',
    'implements a simple queue', 'converts a decimal number to binary',
    'finds the second largest number in a list', 'capitalizes the first letter of every word',
    'computes the sum of the digits of a number', 'implements bubble sort',
    'downloads a web page and prints its title', 'parses a JSON string into an object',
    'finds the longest word in a sentence', 'rotates an array by k positions',
    'checks whether a year is a leap year', 'counts the vowels in a string',
    'implements a basic calculator for two numbers', 'transposes a matrix',
    'prints the multiplication table up to 10', 'measures how long a function takes to run',
    'writes a list of lines to a file',
]

CODE_TEMPLATES = [
    'Write a {lang} function that {task}.', 'How do I write code that {task} in {lang}?',
    'Show me a {lang} example that {task}, with comments.',
    'Can you write a short {lang} program that {task}?',
    'I need a {lang} snippet that {task}. Please explain it too.',
]

CODE_SNIPPETS = [
    ("python", "def f(xs):\n    return [x * x for x in xs if x % 2 == 0]"),
    (
        "python",
        "import collections\n\ndef top(words, n):\n"
        "    return collections.Counter(words).most_common(n)",
    ),
    ("javascript", "const add = (a, b) => a + b;\nconsole.log([1, 2, 3].reduce(add, 0));"),
    ("c", "int count(const char *s) {\n    int n = 0;\n    while (*s++) n++;\n    return n;\n}"),
    (
        "python",
        "for i in range(1, 16):\n    print('FizzBuzz' if i % 15 == 0 else 'Fizz' if i % 3 == 0"
        " else 'Buzz' if i % 5 == 0 else i)",
    ),
    (
        "sql",
        "SELECT name, COUNT(*) AS orders\nFROM customers JOIN orders USING (customer_id)\n"
        "GROUP BY name\nORDER BY orders DESC\nLIMIT 5;",
    ),
    (
        "rust",
        "fn main() {\n    let v: Vec<i32> = (1..=10).filter(|x| x % 3 == 0).collect();\n"
        '    println!("{:?}", v);\n}',
    ),
    ("bash", 'for f in *.txt; do\n  wc -l "$f"\ndone | sort -n'),
    (
        "python",
        "def mean(xs):\n    total = 0\n    for x in xs:\n        total += x\n"
        "    return total / len(xs)",
    ),
    (
        "go",
        "func sum(xs []int) int {\n\ts := 0\n\tfor _, x := range xs {\n\t\ts += x\n\t}\n"
        "\treturn s\n}",
    ),
]

SNIPPET_QUESTIONS = [
    'What does this code do?', 'Can you explain this code line by line?',
    'Is there a bug in this code? How would you improve it?',
    'How could I make this code faster or cleaner?', 'Add comments to this code.',
]

COMPARE_PAIRS = [
    ('cats', 'dogs'), ('Python', 'JavaScript'), ('tea', 'coffee'), ('renting', 'buying a home'),
    ('solar power', 'wind power'), ('TCP', 'UDP'), ('books', 'movies'), ('summer', 'winter'),
    ('trains', 'planes'), ('stocks', 'bonds'), ('email', 'instant messaging'),
    ('a laptop', 'a desktop computer'), ('running', 'swimming'), ('SQL', 'NoSQL databases'),
    ('democracy', 'monarchy'), ('cities', 'the countryside'), ('paper books', 'e-readers'),
    ('viruses', 'bacteria'), ('weather', 'climate'), ('Linux', 'Windows'), ('baking', 'frying'),
    ('git merge', 'git rebase'), ('mitosis', 'meiosis'), ('a credit card', 'a debit card'),
    ('alligators', 'crocodiles'), ('speed', 'velocity'), ('classical music', 'rock music'),
    ('working from home', 'working in an office'), ('lists', 'tuples in Python'),
    ('nuclear power', 'coal power'),
]

COMPARE_TEMPLATES = [
    'Compare {a} and {b}.', 'What is the difference between {a} and {b}?',
    'Which is better, {a} or {b}? Explain your reasoning.',
    'Give me a table comparing {a} and {b}.', 'What do {a} and {b} have in common?',
]

HOWTO = [
    'make a good cup of tea', 'start learning to play the guitar', 'plan a budget for the month',
    'prepare for a job interview', 'write a good cover letter', 'grow tomatoes at home',
    'improve my sleep', 'learn a new language quickly', 'change a flat tire', 'study for an exam',
    'make a simple website', 'save money on groceries', 'train for a 5k run',
    'keep houseplants alive', 'organize my closet', 'cook rice on the stove',
    'give a good presentation', 'back up my computer', 'start a vegetable garden',
    'make friends in a new city', 'write a resume', 'reduce stress at work',
    'set up a Python virtual environment', 'clean a cast iron pan',
    'take better photos with a phone', 'learn to code', 'make pancakes from scratch',
    'stay focused while studying', 'use git for the first time', 'negotiate a salary',
    'write a short story', 'meditate', 'pack for a week-long trip', 'fix a slow computer',
    'brew beer at home', 'paint a room',
]

HOWTO_TEMPLATES = [
    'How do I {h}?', 'What is the best way to {h}?', 'Give me step-by-step instructions to {h}.',
    'I want to {h}. Where should I start?', 'What are some tips to {h}?',
]

LIST_REQUESTS = [
    'ways to save energy at home', 'healthy breakfast ideas', 'books every teenager should read',
    'tips for writing clean code', 'things to do on a rainy day',
    'famous scientists and what they discovered', 'common interview questions',
    'ideas for a birthday party', 'benefits of regular exercise',
    'reasons to learn a second language', 'easy dinner recipes',
    'fun science experiments for kids', 'habits of productive people',
    'countries in South America and their capitals', 'board games for families',
    'ways to reduce plastic waste', 'useful Linux commands', 'questions to ask on a first date',
    'tips for traveling on a budget', 'classic movies to watch', 'hobbies that cost little money',
    'ways to improve your memory', 'Python libraries for data science',
    'signs that you need a break', 'famous paintings and their painters',
]

LIST_TEMPLATES = [
    'List {n} {x}.', 'Give me a list of {n} {x}.', 'What are {n} {x}?',
    'Can you name {n} {x}, with a sentence about each?',
]

WRITING_TASKS = [
    'a short email to my boss asking for a day off', 'a thank-you note to a friend',
    'a short story about a robot who learns to paint', 'a product description for a water bottle',
    'a limerick about a cat', 'a motivational message for a student before exams',
    "a short speech for a friend's wedding", 'a complaint letter about a late delivery',
    'a tweet announcing a new coffee shop', 'a bedtime story about a brave little mouse',
    'an invitation to a picnic', 'a short review of a restaurant', 'a poem about autumn',
    'a text message apologizing for being late', 'a job posting for a junior developer',
    'a dialogue between a teacher and a student', 'a short mystery story opening',
    'a description of a sunset at the beach', 'a LinkedIn summary for a nurse',
    'an out-of-office reply', 'a riddle with its answer', 'a toast for a retirement party',
    'a short fable with a moral', 'a welcome message for new club members',
]

WRITING_TEMPLATES = [
    'Write {w}.', 'Please write {w}.', 'Can you help me write {w}?', 'Draft {w}.',
]

PASSAGES = [
    "The city council voted on Tuesday to expand the bike lane network by 40 kilometres over the "
    "next three years. Supporters argued that the lanes would reduce traffic and pollution, while "
    "some shop owners worried about losing parking spaces. The plan will be funded partly by a "
    "national grant.",
    "Researchers found that people who walked for thirty minutes a day slept better and reported "
    "less anxiety than those who did not. The study followed 2,000 adults for a year. The authors "
    "caution that the effect may partly come from spending more time outdoors.",
    "The company reported record profits this quarter, driven by strong sales of its new phone. "
    "However, it warned that supply problems could slow production next year, and its shares fell "
    "slightly after the announcement.",
    "Honeybees communicate the location of flowers through a 'waggle dance'. The angle of the "
    "dance shows the direction relative to the sun, and its length shows the distance. Other "
    "bees watch the dance and then fly straight to the food.",
    "A new library opened downtown with a maker space, free classes and a children's reading "
    "room. Over 3,000 people visited on the first weekend. The building uses solar panels and "
    "collects rainwater for its garden.",
    "Scientists have discovered a new species of frog in the rainforest of Ecuador. The frog is "
    "only two centimetres long and has bright orange skin, which warns predators that it is "
    "poisonous. Its habitat is threatened by logging.",
    "The school will switch to a four-day week next year to save money and attract teachers. "
    "Parents are divided: some welcome the long weekend, others worry about childcare on the "
    "fifth day. The district will review the change after one year.",
    "Our team missed the release date because testing found a serious bug in the payment code. "
    "We fixed it, added new tests, and now plan to release next Monday. We will also review our "
    "process so that such bugs are found earlier.",
]

PASSAGE_TEMPLATES = [
    'Summarize this in one sentence:\n\n{p}', 'Give me the key points of this text:\n\n{p}',
    'Explain this to me in simple words:\n\n{p}', 'What is the main idea here?\n\n{p}',
]

# (question, an assistant answer written here) for multi-turn conversations
EXCHANGES = [
    ("What is the capital of Australia?", "The capital of Australia is Canberra."),
    ("How many legs does a spider have?", "A spider has eight legs."),
    (
        "What is a noun?",
        "A noun is a word that names a person, place, thing or idea, such as "
        "'teacher', 'London' or 'happiness'.",
    ),
    (
        "Can you recommend a good book?",
        "Sure! 'To Kill a Mockingbird' by Harper Lee is a classic about justice and growing up.",
    ),
    ("What is 15% of 80?", "15% of 80 is 12."),
    (
        "How do I boil an egg?",
        "Place the egg in boiling water for about 9 minutes, then cool it "
        "in cold water before peeling.",
    ),
    ("What does HTML stand for?", "HTML stands for HyperText Markup Language."),
    (
        "Why is the sky blue?",
        "Sunlight scatters off air molecules, and blue light scatters the "
        "most, so the sky looks blue.",
    ),
    ("What is a good name for a goldfish?", "How about 'Bubbles', 'Goldie' or 'Captain Fin'?"),
    ("Write a Python one-liner to sum a list.", "You can use `total = sum(my_list)`."),
    ("Who painted the Mona Lisa?", "Leonardo da Vinci painted the Mona Lisa in the early 1500s."),
    (
        "What is the boiling point of water?",
        "Water boils at 100 degrees Celsius (212 degrees Fahrenheit) at sea level.",
    ),
    (
        "I feel tired all the time. Any advice?",
        "Try keeping a regular sleep schedule, drinking "
        "enough water and getting some daylight. If it continues, see a doctor.",
    ),
    (
        "What is recursion?",
        "Recursion is when a function calls itself to solve smaller instances of the same problem.",
    ),
    (
        "Suggest a weekend activity.",
        "You could go for a hike, visit a museum, or try cooking a new recipe with friends.",
    ),
    ("What is the largest planet?", "Jupiter is the largest planet in our solar system."),
    ("How do I say hello in Spanish?", "You say 'hola'."),
    (
        "What is an API?",
        "An API is a set of rules that lets one program ask another program for data or services.",
    ),
    ("Give me a word that rhymes with 'light'.", "'Night' rhymes with 'light'."),
    ("What is a healthy snack?", "An apple with a handful of almonds is a healthy snack."),
    (
        "What causes the seasons?",
        "The seasons are caused by the tilt of Earth's axis as it orbits the Sun.",
    ),
    (
        "How do I reverse a list in Python?",
        "Use `my_list.reverse()` to reverse it in place, or "
        "`my_list[::-1]` to get a reversed copy.",
    ),
    (
        "What is the difference between 'affect' and 'effect'?",
        "'Affect' is usually a verb meaning "
        "to influence, and 'effect' is usually a noun meaning a result.",
    ),
    ("Tell me a joke.", "Why don't scientists trust atoms? Because they make up everything!"),
]

FOLLOW_UPS = [
    'Can you give me an example?', 'Can you explain that in more detail?', 'Make it shorter.',
    'Why is that?', 'Can you put that in a list?', 'Thanks! What else should I know?',
    'Can you explain it more simply?', 'Is that always true?', 'Tell me more.',
    'How would I use that in practice?', 'Can you say that in a different way?',
    'What is a common mistake people make with this?',
]
# fmt: on
