"""Relation families for lookup questions: facts as documents state them, questions as people ask them.

A family is one kind of fact: the access code of a place, the chief engineer of a project, the day
a festival is held, the default port of a service. Each has a subject kind, the sentence a document
states it in, a plain question and one or more paraphrases that share few words with the fact
("Which code opens the north warehouse?" for "The access code for the north warehouse is 31548.").

The split is fixed (`SPLIT_SEED`) and by kind, never by sample:
- `HELD_OUT_FAMILY_SHARE` of the families are held out whole: never in training, in any wording;
- of the other families, `HELD_OUT_PARAPHRASE_SHARE` are trained on their plain question only:
  their paraphrases are held out (the model must carry paraphrasing over from other families);
- of the framings a question is put in (`FRAMINGS`: "Tell me ...", "Quick question: ..."), the
  `HELD_OUT_FRAMINGS` are never used in training, for any family;
- of the dressings a fact is worded in (`DRESSINGS`: "As of 2024, ...", "..., who signed the new
  berth contract."), the `HELD_OUT_DRESSINGS` are never used in training.
`split()` gives the families and wordings on each side; `tests/test_relations.py` checks that no
held-out family, paraphrase, framing or dressing can reach a training sample.
"""

from __future__ import annotations

import dataclasses
import random
import re
from dataclasses import dataclass

SPLIT_SEED = 20261201
HELD_OUT_FAMILY_SHARE = 0.2
HELD_OUT_PARAPHRASE_SHARE = 0.25  # of the training families: asked only plainly in training
NOT_FOUND = "not found"  # what the model answers when the documents do not hold the fact

# Framings around a question (the question's own words in {q}, lower-cased first letter in {ql}).
FRAMINGS = ("{q}", "Tell me {ql}", "Could you tell me {ql}", "I need to know: {q}", "Quick question: {q}",
            "According to the documents, {ql}", "Please look up {ql}", "{q} Answer briefly.")
HELD_OUT_FRAMINGS = ("Quick question: {q}", "Please look up {ql}")

# One family a line: subject kind | fact sentence | plain question | paraphrases (;-separated) | value kind.
# {s} is the subject (with its article), {v} the value.
_FAMILIES = """
place | The access code for {s} is {v}. | What is the access code for {s}? | Which code opens {s}?; What do I type at the door of {s}? | code
place | The alarm at {s} is reset with code {v}. | What code resets the alarm at {s}? | How do I silence the alarm at {s}? | code
place | {S} opens every day at {v}. | When does {s} open? | What time can I get into {s} in the morning? | time
place | {S} closes at {v} on weekdays. | When does {s} close on weekdays? | Until what time can I stay at {s} on a weekday? | time
place | The manager of {s} is {v}. | Who is the manager of {s}? | Who runs {s}? | person
place | {S} can hold up to {v} people. | How many people can {s} hold? | What is the capacity of {s}? | count
place | The phone extension for {s} is {v}. | What is the phone extension for {s}? | Which extension do I dial to reach {s}? | code
place | {S} was built in {v}. | When was {s} built? | How old is {s}: in which year was it finished? | year
place | The floor area of {s} is {v} square metres. | What is the floor area of {s}? | How big is {s} in square metres? | count
place | Deliveries to {s} go through gate {v}. | Which gate do deliveries to {s} use? | Where should a lorry enter to drop goods at {s}? | small
place | The fire marshal for {s} is {v}. | Who is the fire marshal for {s}? | Who is responsible for fire safety at {s}? | person
place | The wifi password at {s} is {v}. | What is the wifi password at {s}? | How do I get online at {s}? | word
place | {S} is painted {v}. | What colour is {s} painted? | What colour are the walls of {s}? | colour
place | The nearest hospital to {s} is in {v}. | Where is the nearest hospital to {s}? | If someone is hurt at {s}, which town has the closest hospital? | city
place | Parking at {s} costs {v} a day. | How much does parking at {s} cost a day? | What is the daily fee to leave a car at {s}? | money
place | The storage temperature in {s} is kept at {v} degrees. | At what temperature is {s} kept? | How cold is it inside {s}? | small
place | The inspection code for {s} is {v}. | What is the inspection code for {s}? | Which code do inspectors quote for {s}? | code
place | {S} is cleaned every {v}. | On which day is {s} cleaned? | When do the cleaners come to {s}? | weekday
place | The key to {s} is kept by {v}. | Who keeps the key to {s}? | Whom do I ask to unlock {s}? | person
place | {S} has {v} loading bays. | How many loading bays does {s} have? | How many lorries can unload at {s} at once? | small
project | The chief engineer of {s} is {v}. | Who is the chief engineer of {s}? | Who leads the engineering on {s}? | person
project | {S} has a budget of {v}. | What is the budget of {s}? | How much money has been set aside for {s}? | money
project | {S} is due to be finished in {v}. | When is {s} due to be finished? | By what year should {s} be complete? | year
project | The contractor for {s} is {v}. | Who is the contractor for {s}? | Which firm was hired to build {s}? | company
project | Work on {s} began on {v}. | When did work on {s} begin? | What was the first day of construction on {s}? | date
project | The reference number of {s} is {v}. | What is the reference number of {s}? | Which number identifies {s} in the files? | code
project | {S} is funded by {v}. | Who funds {s}? | Where does the money for {s} come from? | company
project | The site of {s} is in {v}. | Where is the site of {s}? | In which town is {s} being built? | city
project | {S} employs {v} workers. | How many workers does {s} employ? | How large is the crew on {s}? | count
project | The architect of {s} is {v}. | Who is the architect of {s}? | Who drew the plans for {s}? | person
project | The safety officer on {s} is {v}. | Who is the safety officer on {s}? | Whom should I report a hazard on {s} to? | person
project | {S} was approved by the council in {v}. | When did the council approve {s}? | In which year was {s} given the go-ahead? | year
project | The planned length of {s} is {v} metres. | What is the planned length of {s}? | How long will {s} be when finished? | count
project | The code name of {s} is {v}. | What is the code name of {s}? | What do insiders call {s}? | word
project | {S} is {v} percent complete. | How complete is {s}? | How far along is {s}? | percent
event | {S} is held on {v}. | When is {s} held? | On what day can I go to {s}? | date
event | {S} takes place in {v}. | Where does {s} take place? | In which town is {s}? | city
event | Tickets for {s} cost {v}. | How much do tickets for {s} cost? | What is the price of entry to {s}? | money
event | The organiser of {s} is {v}. | Who organises {s}? | Who is behind {s}? | person
event | {S} was first held in {v}. | When was {s} first held? | How long ago did {s} start: in which year? | year
event | {S} lasts {v} days. | How many days does {s} last? | How long does {s} go on for? | small
event | The main speaker at {s} is {v}. | Who is the main speaker at {s}? | Who gives the keynote at {s}? | person
event | About {v} visitors come to {s} each year. | How many visitors come to {s} each year? | How big is the crowd at {s}? | count
event | The theme of {s} this year is {v}. | What is the theme of {s} this year? | What is {s} about this time? | word
event | {S} starts at {v}. | What time does {s} start? | When should I arrive for the opening of {s}? | time
event | The prize at {s} is {v}. | What is the prize at {s}? | How much can a winner take home from {s}? | money
event | Registration for {s} closes on {v}. | When does registration for {s} close? | What is the last day to sign up for {s}? | date
event | {S} is sponsored by {v}. | Who sponsors {s}? | Which company pays for {s}? | company
event | The venue of {s} is {v}. | What is the venue of {s}? | In which hall is {s}? | place
event | The dress code for {s} is {v}. | What is the dress code for {s}? | What should I wear to {s}? | word
service | The default port of {s} is {v}. | What is the default port of {s}? | Which port does {s} listen on unless told otherwise? | port
service | The current version of {s} is {v}. | What is the current version of {s}? | Which release of {s} is the latest? | version
service | {S} keeps its configuration in {v}. | Where does {s} keep its configuration? | Which file do I edit to configure {s}? | path
service | {S} writes its log to {v}. | Where does {s} write its log? | Where can I read the messages of {s}? | path
service | The maintainer of {s} is {v}. | Who maintains {s}? | Whom do I write to about a bug in {s}? | person
service | {S} times out after {v} seconds. | After how many seconds does {s} time out? | How long does {s} wait before giving up? | small
service | {S} allows at most {v} connections. | How many connections does {s} allow? | What is the connection limit of {s}? | count
service | {S} runs as the user {v}. | Which user does {s} run as? | Under which account does {s} run? | word
service | {S} is started with the command {v}. | Which command starts {s}? | How do I launch {s}? | command
service | {S} caches up to {v} megabytes. | How much does {s} cache? | What is the cache size of {s}? | count
service | {S} was first released in {v}. | When was {s} first released? | In which year did {s} come out? | year
service | {S} is written in {v}. | In which language is {s} written? | What programming language was used for {s}? | language
service | The licence of {s} is {v}. | What is the licence of {s}? | Under which terms may I copy {s}? | licence
service | {S} retries a failed job {v} times. | How many times does {s} retry a failed job? | How often does {s} try again after a failure? | small
service | {S} checks for updates every {v} hours. | How often does {s} check for updates? | How many hours pass between update checks of {s}? | small
service | The environment variable that sets the data folder of {s} is {v}. | Which environment variable sets the data folder of {s}? | How do I tell {s} where to keep its data? | envvar
service | {S} listens on the address {v} by default. | Which address does {s} listen on by default? | Which interface does {s} bind to out of the box? | address
service | The option that makes {s} print more is {v}. | Which option makes {s} print more? | How do I get {s} to be verbose? | option
service | {S} rotates its log after {v} days. | After how many days does {s} rotate its log? | How long does {s} keep one log file? | small
service | The default timeout of {s} is {v} milliseconds. | What is the default timeout of {s}? | How many milliseconds does {s} wait by default? | count
organisation | The director of {s} is {v}. | Who is the director of {s}? | Who heads {s}? | person
organisation | {S} was founded in {v}. | When was {s} founded? | How old is {s}: since which year has it existed? | year
organisation | {S} has its head office in {v}. | Where is the head office of {s}? | In which city is {s} based? | city
organisation | {S} has {v} members. | How many members does {s} have? | How large is the membership of {s}? | count
organisation | The treasurer of {s} is {v}. | Who is the treasurer of {s}? | Who looks after the money of {s}? | person
organisation | The annual fee of {s} is {v}. | What is the annual fee of {s}? | How much does it cost each year to belong to {s}? | money
organisation | The registration number of {s} is {v}. | What is the registration number of {s}? | Under which number is {s} registered? | code
organisation | {S} meets every {v}. | On which day does {s} meet? | When do the members of {s} get together? | weekday
organisation | The secretary of {s} is {v}. | Who is the secretary of {s}? | Who keeps the minutes at {s}? | person
organisation | The motto of {s} is "{v}". | What is the motto of {s}? | What saying does {s} live by? | word
organisation | {S} employs {v} staff. | How many staff does {s} employ? | How many people work for {s}? | count
organisation | The founder of {s} is {v}. | Who founded {s}? | Who started {s}? | person
organisation | The auditor of {s} is {v}. | Who audits {s}? | Which firm checks the accounts of {s}? | company
organisation | The colour of {s} is {v}. | What is the colour of {s}? | Which colour stands for {s}? | colour
organisation | {S} is a member of {v}. | What is {s} a member of? | Which larger body does {s} belong to? | company
vessel | The captain of {s} is {v}. | Who is the captain of {s}? | Who commands {s}? | person
vessel | {S} was launched in {v}. | When was {s} launched? | In which year did {s} first take to the water? | year
vessel | The home port of {s} is {v}. | What is the home port of {s}? | Where is {s} based? | city
vessel | {S} is {v} metres long. | How long is {s}? | What is the length of {s}? | count
vessel | {S} carries up to {v} passengers. | How many passengers does {s} carry? | How many people fit on {s}? | count
vessel | The call sign of {s} is {v}. | What is the call sign of {s}? | How is {s} hailed on the radio? | callsign
vessel | {S} sails to {v} every week. | Where does {s} sail every week? | What is the weekly destination of {s}? | city
vessel | The chief engineer of {s} is {v}. | Who is the chief engineer of {s}? | Who looks after the engines of {s}? | person
vessel | {S} was built by {v}. | Who built {s}? | Which yard made {s}? | company
vessel | The top speed of {s} is {v} knots. | What is the top speed of {s}? | How fast can {s} go? | small
vessel | {S} flies the flag of {v}. | Which flag does {s} fly? | Where is {s} registered? | country
vessel | {S} leaves the harbour at {v}. | When does {s} leave the harbour? | At what time does {s} depart? | time
vessel | The cargo of {s} is {v}. | What is the cargo of {s}? | What does {s} carry? | goods
vessel | The radio channel of {s} is {v}. | Which radio channel does {s} use? | On which channel can I reach {s}? | small
vessel | {S} has a crew of {v}. | How large is the crew of {s}? | How many sailors work on {s}? | small
product | The price of {s} is {v}. | What is the price of {s}? | How much does {s} cost? | money
product | {S} weighs {v} grams. | How much does {s} weigh? | What is the weight of {s}? | count
product | The model number of {s} is {v}. | What is the model number of {s}? | Which number identifies {s} in the catalogue? | code
product | {S} comes with a warranty of {v} years. | How long is the warranty on {s}? | For how many years is {s} covered? | small
product | {S} is made in {v}. | Where is {s} made? | In which country is {s} manufactured? | country
product | The battery of {s} lasts {v} hours. | How long does the battery of {s} last? | How many hours can {s} run on one charge? | small
product | {S} was designed by {v}. | Who designed {s}? | Whose design is {s}? | person
product | The firmware of {s} is at version {v}. | What firmware version does {s} run? | Which firmware release is on {s}? | version
product | {S} is sold by {v}. | Who sells {s}? | Where can I buy {s}? | company
product | {S} uses {v} batteries. | Which batteries does {s} use? | What kind of battery goes into {s}? | battery
product | The serial number of {s} is {v}. | What is the serial number of {s}? | Which serial is printed on {s}? | code
product | {S} comes in {v}. | What colour does {s} come in? | Which colour is {s} sold in? | colour
product | {S} holds {v} litres. | How much does {s} hold? | What is the volume of {s}? | small
product | {S} reaches a maximum of {v} watts. | What is the maximum power of {s}? | How many watts can {s} draw at most? | count
product | {S} was recalled in {v}. | When was {s} recalled? | In which year was {s} taken back from shops? | year
person | {S} was born in {v}. | Where was {s} born? | What is the birthplace of {s}? | city
person | {S} was born on {v}. | When was {s} born? | What is the birthday of {s}? | date
person | {S} works as {v}. | What does {s} do for a living? | What is the job of {s}? | job
person | The email address of {s} is {v}. | What is the email address of {s}? | How can I write to {s}? | email
person | {S} lives in {v}. | Where does {s} live? | Which town is {s} from these days? | city
person | The employee number of {s} is {v}. | What is the employee number of {s}? | Which staff number does {s} have? | code
person | {S} joined the company in {v}. | When did {s} join the company? | Since which year has {s} worked here? | year
person | The manager of {s} is {v}. | Who is the manager of {s}? | Whom does {s} report to? | person
person | {S} speaks {v}. | Which language does {s} speak? | In what language can I talk to {s}? | language
person | The office of {s} is room {v}. | Which room is the office of {s}? | Where can I find {s} at work? | small
person | {S} drives a {v} car. | What colour is the car of {s}? | Which colour car does {s} drive? | colour
person | The favourite food of {s} is {v}. | What is the favourite food of {s}? | What does {s} like to eat most? | food
person | {S} is married to {v}. | Who is {s} married to? | Who is the spouse of {s}? | person
person | {S} studied at {v}. | Where did {s} study? | Which university did {s} go to? | company
person | {S} owns {v} horses. | How many horses does {s} own? | How many horses are in the stable of {s}? | small
person | The desk phone of {s} is extension {v}. | What is the desk phone extension of {s}? | Which extension rings on the desk of {s}? | code
person | The badge colour of {s} is {v}. | What is the badge colour of {s}? | What colour badge does {s} wear? | colour
person | {S} retired in {v}. | When did {s} retire? | In which year did {s} stop working? | year
person | The mentor of {s} is {v}. | Who is the mentor of {s}? | Who guides {s}? | person
person | {S} won the {v} award. | Which award did {s} win? | What prize was given to {s}? | word
route | The {s} leaves every {v} minutes. | How often does the {s} leave? | How long do I wait between two departures of the {s}? | small
route | The last departure of the {s} is at {v}. | When is the last departure of the {s}? | What time does the final {s} go? | time
route | A single ticket on the {s} costs {v}. | How much is a single ticket on the {s}? | What is the fare of the {s}? | money
route | The {s} ends at {v}. | Where does the {s} end? | What is the last stop of the {s}? | place
route | The {s} is {v} kilometres long. | How long is the {s}? | What distance does the {s} cover? | count
route | The {s} has {v} stops. | How many stops does the {s} have? | At how many places does the {s} halt? | small
route | The {s} is run by {v}. | Who runs the {s}? | Which operator drives the {s}? | company
route | The {s} first ran in {v}. | When did the {s} first run? | Since which year has the {s} existed? | year
route | The driver of the early {s} is {v}. | Who drives the early {s}? | Who is at the wheel of the first {s} of the day? | person
route | The {s} takes {v} minutes from end to end. | How long does the {s} take from end to end? | How much time does a full trip on the {s} take? | count
route | The {s} starts at {v}. | Where does the {s} start? | What is the first stop of the {s}? | place
route | The {s} does not run on {v}. | On which day does the {s} not run? | When is there no {s}? | weekday
account | The account number of {s} is {v}. | What is the account number of {s}? | Which number do I use to pay into {s}? | code
account | {S} holds {v}. | How much does {s} hold? | What is the balance of {s}? | money
account | {S} was opened on {v}. | When was {s} opened? | What is the opening date of {s}? | date
account | The holder of {s} is {v}. | Who holds {s}? | Whose name is on {s}? | person
account | {S} pays interest of {v} percent. | What interest does {s} pay? | What is the interest rate on {s}? | percent
account | The PIN of {s} is {v}. | What is the PIN of {s}? | Which secret number unlocks {s}? | code
account | {S} is kept at {v}. | Where is {s} kept? | Which bank holds {s}? | company
account | The monthly limit of {s} is {v}. | What is the monthly limit of {s}? | How much can be spent from {s} in a month? | money
account | The branch code of {s} is {v}. | What is the branch code of {s}? | Which sort code goes with {s}? | code
account | {S} is closed on {v}. | When will {s} be closed? | On what date does {s} end? | date
animal | {S} eats {v}. | What does {s} eat? | What is {s} fed? | food
animal | {S} weighs {v} kilograms. | How much does {s} weigh? | How heavy is {s}? | count
animal | The keeper of {s} is {v}. | Who is the keeper of {s}? | Who looks after {s}? | person
animal | {S} was born in {v}. | When was {s} born? | How old is {s}: in which year was it born? | year
animal | {S} lives in enclosure {v}. | Which enclosure does {s} live in? | Where can I see {s}? | small
animal | {S} came from {v}. | Where did {s} come from? | Where was {s} before it arrived here? | city
animal | The vet of {s} is {v}. | Who is the vet of {s}? | Which doctor treats {s}? | person
animal | {S} is fed at {v}. | When is {s} fed? | At what time does {s} get its food? | time
animal | The tag number of {s} is {v}. | What is the tag number of {s}? | Which number is on the ear tag of {s}? | code
animal | {S} has {v} stripes. | How many stripes does {s} have? | How many bands of colour does {s} have? | small
dish | {S} takes {v} minutes to cook. | How long does {s} take to cook? | How much time does {s} need in the oven? | small
dish | The main ingredient of {s} is {v}. | What is the main ingredient of {s}? | What is {s} mostly made of? | food
dish | {S} serves {v} people. | How many people does {s} serve? | How many can eat from one {s}? | small
dish | {S} was created by {v}. | Who created {s}? | Whose recipe is {s}? | person
dish | {S} comes from {v}. | Where does {s} come from? | Which region is {s} a speciality of? | city
dish | {S} is baked at {v} degrees. | At what temperature is {s} baked? | How hot should the oven be for {s}? | count
dish | {S} costs {v} at the canteen. | How much does {s} cost at the canteen? | What is the canteen price of {s}? | money
dish | {S} is served on {v}. | On which day is {s} served? | When is {s} on the menu? | weekday
dish | {S} is topped with {v}. | What is {s} topped with? | What goes on top of {s}? | food
dish | {S} has {v} calories a portion. | How many calories does a portion of {s} have? | How much energy is in one serving of {s}? | count
document | {S} was signed on {v}. | When was {s} signed? | What is the date of signature of {s}? | date
document | {S} was signed by {v}. | Who signed {s}? | Whose signature is on {s}? | person
document | {S} expires on {v}. | When does {s} expire? | Until when is {s} valid? | date
document | The file number of {s} is {v}. | What is the file number of {s}? | Under which number is {s} filed? | code
document | {S} runs to {v} pages. | How many pages does {s} have? | How long is {s}? | count
document | {S} was written by {v}. | Who wrote {s}? | Who is the author of {s}? | person
document | {S} is kept in {v}. | Where is {s} kept? | Where can I find the original of {s}? | place
document | {S} was approved by {v}. | Who approved {s}? | Who gave {s} the final sign-off? | person
document | {S} is classified as {v}. | How is {s} classified? | What is the security level of {s}? | word
document | {S} was last revised in {v}. | When was {s} last revised? | In which year was {s} updated last? | year
document | The penalty in {s} is {v}. | What is the penalty in {s}? | How much must be paid for breaking {s}? | money
document | {S} covers {v}. | What does {s} cover? | What is {s} about? | goods
plant | {S} flowers in {v}. | When does {s} flower? | In which month does {s} bloom? | month
plant | {S} grows up to {v} centimetres tall. | How tall does {s} grow? | What height can {s} reach? | count
plant | {S} needs water every {v} days. | How often does {s} need water? | How many days can {s} go between waterings? | small
plant | {S} was planted by {v}. | Who planted {s}? | Whose hands put {s} in the ground? | person
plant | {S} was brought here from {v}. | Where was {s} brought from? | What is the origin of {s}? | country
"""

_LIST_FAMILIES = """
place | The shift leaders at {s} are {v}. | Who are the shift leaders at {s}? | Who is in charge of the shifts at {s}? | persons
project | The partners in {s} are {v}. | Who are the partners in {s}? | Which firms work together on {s}? | companies
event | The bands playing at {s} are {v}. | Which bands play at {s}? | Who performs at {s}? | bands
service | {S} supports the formats {v}. | Which formats does {s} support? | What kinds of file can {s} read? | formats
organisation | The board of {s} is {v}. | Who is on the board of {s}? | Who sits on the governing board of {s}? | persons
vessel | {S} calls at {v}. | Which ports does {s} call at? | Where does {s} stop on its voyage? | cities
product | {S} is sold in {v}. | Which colours is {s} sold in? | In what colours can I get {s}? | colours
dish | {S} is made with {v}. | What is {s} made with? | Which ingredients go into {s}? | foods
route | The {s} stops at {v}. | Where does the {s} stop? | Which stations does the {s} serve? | places
person | The children of {s} are {v}. | Who are the children of {s}? | What are the names of the kids of {s}? | persons
service | {S} depends on {v}. | What does {s} depend on? | Which packages must be installed for {s}? | packages
"""


@dataclass(frozen=True)
class Family:
    id: str  # stable: "<subject kind>/<index within its kind>"
    subject_kind: str
    fact: str  # "The access code for {s} is {v}." ({S}: the subject with a capital)
    question: str  # the plain question
    paraphrases: tuple[str, ...]  # questions that share few words with the fact
    value_kind: str

    @property
    def is_list(self) -> bool:
        return self.value_kind in LIST_KINDS


LIST_KINDS = ("persons", "companies", "bands", "formats", "cities", "colours", "foods", "places", "packages")


def _parse(table: str) -> list[Family]:
    out, counts = [], {}
    for line in table.strip().splitlines():
        kind, fact, question, paraphrases, value = (part.strip() for part in line.split("|"))
        counts[kind] = counts.get(kind, 0) + 1
        out.append(Family(f"{kind}/{counts[kind]:02d}", kind, fact, question,
                          tuple(p.strip() for p in paraphrases.split(";") if p.strip()), value))
    return out


def families() -> list[Family]:
    """Every family, single-valued then lists, in a fixed order."""
    singles = _parse(_FAMILIES)
    lists = [Family(f.id.replace("/", "/list-"), f.subject_kind, f.fact, f.question, f.paraphrases, f.value_kind)
             for f in _parse(_LIST_FAMILIES)]
    return singles + lists


@dataclass(frozen=True)
class Split:
    train_families: tuple[Family, ...]
    held_out_families: tuple[Family, ...]
    held_out_paraphrases: frozenset[str]  # ids of training families whose paraphrases are held out
    train_framings: tuple[str, ...]
    held_out_framings: tuple[str, ...]

    def train_wordings(self, family: Family) -> tuple[str, ...]:
        """The questions training asks of a training family: the plain one, and its paraphrases
        unless they are held out."""
        if family.id in self.held_out_paraphrases:
            return (family.question,)
        return (family.question, *family.paraphrases)

    def held_out_wordings(self, family: Family) -> tuple[str, ...]:
        """The questions never trained on: every wording of a held-out family, the paraphrases of a
        training family whose paraphrases are held out."""
        if family in self.held_out_families:
            return (family.question, *family.paraphrases)
        return family.paraphrases if family.id in self.held_out_paraphrases else ()


def split() -> Split:
    """The fixed train / held-out split (see the module docstring)."""
    every = families()
    rng = random.Random(SPLIT_SEED)
    order = list(range(len(every)))
    rng.shuffle(order)
    n_held = round(HELD_OUT_FAMILY_SHARE * len(every))
    held = set(order[:n_held])
    train = [f for i, f in enumerate(every) if i not in held]
    paraphrased = rng.sample([f.id for f in train], round(HELD_OUT_PARAPHRASE_SHARE * len(train)))
    return Split(tuple(train), tuple(f for i, f in enumerate(every) if i in held), frozenset(paraphrased),
                 tuple(f for f in FRAMINGS if f not in HELD_OUT_FRAMINGS), HELD_OUT_FRAMINGS)


def frame(question: str, framing: str) -> str:
    """The question put in a framing ("Tell me {ql}": "Tell me what is the ...")."""
    lowered = question[0].lower() + question[1:]
    return framing.format(q=question, ql=lowered)


# ---- subjects and values ---------------------------------------------------------------------------

_NAMES = ("Tarn Velda Orrin Marsh Keld Ashby Brenna Corrow Dunmore Elsk Farrow Galloway Hesk Ivel Jarrow Kestle "
          "Lindum Morwen Nessa Oakham Pellow Quarne Rossel Skelby Thorne Ulla Vantor Wenlock Yarrow Zenna").split()
_FIRST = ("Ines Odile Tomas Priya Kofi Mara Henrik Aiko Lucia Dmitri Fatima Owen Greta Ravi Selma Jonas Amara "
          "Felix Noor Viktor Leila Bruno Hana Caleb Ingrid Mateo Yara Emil Sofia Arjun").split()
_LAST = ("Varga Okafor Lindqvist Moreau Tanaka Castillo Brennan Haddad Novak Ferreira Kowalski Ng Abara Dahl "
         "Rossi Mensah Sato Petrov Quinn Alvarez Becker Iyer Larsen Osei Duarte Kaur Holm Silva Reyes Farouk").split()
_SUBJECT_NOUNS = {
    "place": "warehouse depot archive workshop lab pavilion boathouse library garage clinic".split(),
    "project": "bridge tunnel dam pier railway school harbour canal tower reservoir".split(),
    "event": "lantern festival|book fair|harvest market|regatta|film festival|chess open|music week|"
             "craft fair|kite festival|science night".split("|"),
    "service": None, "organisation": "society|cooperative|institute|guild|trust|club|foundation|union".split("|"),
    "vessel": None, "product": "kettle|lamp|drill|scanner|router|speaker|heater|blender|camera|scale".split("|"),
    "person": None, "route": "bus line|tram line|ferry route|night bus|shuttle|coach service".split("|"),
    "account": "savings account|expense account|reserve fund|travel account|payroll account".split("|"),
    "animal": "tortoise|otter|parrot|camel|lynx|goat|heron|pony|seal|owl".split("|"),
    "dish": "stew|pie|soup|tart|bread|curry|salad|pudding|risotto|flatbread".split("|"),
    "document": "lease|contract|permit|report|charter|agreement|survey|licence|treaty|manual".split("|"),
    "plant": "oak|rose|fern|vine|cedar|lily|maple|orchid|cactus|willow".split("|"),
}
_DIRECTIONS = "north south east west upper lower old new".split()


def subject(kind: str, rng: random.Random) -> str:
    """A subject of `kind`, with its article where it takes one: "the north warehouse", "Ines Varga"."""
    name = rng.choice(_NAMES)
    if kind == "person":
        return f"{rng.choice(_FIRST)} {rng.choice(_LAST)}"
    if kind == "service":
        return f"{name.lower()}{rng.choice(['d', '-server', 'ctl', '-sync', 'mon'])}"
    if kind == "vessel":
        return f"the {rng.choice(['MV', 'SS', 'RV'])} {name}"
    noun = rng.choice(_SUBJECT_NOUNS[kind])
    if kind == "place":
        return f"the {rng.choice(_DIRECTIONS + [name])} {noun}"
    if kind == "route":
        return f"{name} {noun}"  # the family's templates say "the {s}"
    return f"the {name} {noun}"


def _subject_words(subject_: str) -> set[str]:
    """The stems that tell a subject apart: each word's first four letters ("the north warehouse" ->
    {"nort", "ware"}), so a service's name counts apart from its suffix ("tarnd" and "tarn-sync"
    share "tarn")."""
    return {w[:4] for w in re.findall(r"[a-z]+", subject_.lower())} - {"the"}


def near_subject(asked: str, kind: str, rng: random.Random, avoid: set[str] = frozenset(), tries: int = 200) -> str:
    """Another subject of `kind` that shares a word with `asked` ("the north depot" beside "the north
    warehouse", "Ines Okafor" beside "Ines Varga"): a fact about it can be told from the asked one
    only by reading the whole subject. Never `asked` nor one in `avoid`; any other subject where no
    near one is drawn."""
    words = _subject_words(asked)
    taken = {asked, *avoid}
    other = asked
    for _ in range(tries):
        other = subject(kind, rng)
        if other not in taken and words & _subject_words(other):
            return other
    while other in taken:
        other = subject(kind, rng)
    return other


_WORDS = ("amber cobalt juniper saffron granite falcon meadow harbour lantern orchid thistle quartz willow "
          "ember glacier marigold tundra velvet canyon sparrow").split()
_CITIES = "Lisbon Tromso Porto Gdansk Valencia Bergen Cork Malmo Split Tartu Ghent Lyon Turin Leeds Kiel".split()
_COUNTRIES = "Portugal Norway Poland Spain Ireland Sweden Croatia Estonia Belgium France Italy Kenya Chile".split()
_COMPANIES = ("Halden Works|Marsh & Keld|Northline Ltd|Corrow Brothers|Ivel Group|Pellow Engineering|Skelby Trust|"
              "Ashby Bank|Quarne Shipyard|Oakham Foods").split("|")
_COLOURS = "red blue green yellow white black grey orange purple teal".split()
_FOODS = "lentils|barley|salmon|chickpeas|apples|mushrooms|rye|honey|spinach|walnuts|carrots|goat cheese".split("|")
_MONTHS = ("January February March April May June July August September October November December").split()
_WEEKDAYS = "Monday Tuesday Wednesday Thursday Friday Saturday Sunday".split()
_JOBS = "a pilot|a nurse|an electrician|a baker|a surveyor|a translator|a ferry captain|a librarian".split("|")
_LANGS = "Portuguese Norwegian Polish Swahili Finnish Greek Tamil Basque".split()
_CODE_LANGS = "C|Rust|Go|Python|OCaml|Haskell|Java|Lua".split("|")
_LICENCES = "the MIT licence|the GPL version 3|the Apache licence 2.0|the BSD 3-clause licence|the MPL 2.0".split("|")
_FORMATS = "PDF|CSV|JSON|XML|PNG|TIFF|Markdown|YAML".split("|")
_PACKAGES = "libssl3|zlib1g|libsqlite3-0|libxml2|libcurl4|libyaml-0-2|liblzma5".split("|")
_BANDS = "The Gulls|Night Ferry|Copper Kettle|Slow Tide|The Lanterns|North Wind|Paper Boats".split("|")
_PLACES = "the main hall|the old mill|the east gate|the river quay|the town square|the glass house".split("|")


def value(kind: str, rng: random.Random) -> str:
    """A value of `kind`: "31548" for a code, "14 March 2019" for a date, three names for a list."""
    if kind in LIST_KINDS:
        single = {"persons": "person", "companies": "company", "cities": "city", "colours": "colour",
                  "foods": "food"}.get(kind)
        pool = {"bands": _BANDS, "formats": _FORMATS, "places": _PLACES, "packages": _PACKAGES}.get(kind)
        items: list[str] = []
        while len(items) < 3:
            item = value(single, rng) if single else rng.choice(pool)
            if item not in items:
                items.append(item)
        return f"{items[0]}, {items[1]} and {items[2]}"
    simple = {
        "code": lambda: str(rng.randint(10000, 99999)), "count": lambda: str(rng.randint(120, 9800)),
        "small": lambda: str(rng.randint(2, 60)), "year": lambda: str(rng.randint(1890, 2025)),
        "date": lambda: f"{rng.randint(1, 28)} {rng.choice(_MONTHS)} {rng.randint(1950, 2030)}",
        "time": lambda: f"{rng.randint(5, 11)}:{rng.choice(['00', '15', '30', '45'])} {rng.choice(['am', 'pm'])}",
        "money": lambda: f"{rng.randint(2, 950) * 10:,} euros", "percent": lambda: str(rng.randint(3, 97)),
        "person": lambda: f"{rng.choice(_FIRST)} {rng.choice(_LAST)}", "city": lambda: rng.choice(_CITIES),
        "country": lambda: rng.choice(_COUNTRIES), "company": lambda: rng.choice(_COMPANIES),
        "colour": lambda: rng.choice(_COLOURS), "food": lambda: rng.choice(_FOODS), "word": lambda: rng.choice(_WORDS),
        "month": lambda: rng.choice(_MONTHS), "weekday": lambda: rng.choice(_WEEKDAYS), "job": lambda: rng.choice(_JOBS),
        "language": lambda: rng.choice(_LANGS + _CODE_LANGS), "licence": lambda: rng.choice(_LICENCES),
        "port": lambda: str(rng.choice([rng.randint(1024, 9999), rng.randint(10000, 65000)])),
        "version": lambda: f"{rng.randint(0, 9)}.{rng.randint(0, 30)}.{rng.randint(0, 12)}",
        "path": lambda: f"/{rng.choice(['etc', 'var/lib', 'var/log', 'srv'])}/{rng.choice(_WORDS)}"
                        f"{rng.choice(['.conf', '.log', '/main.toml', '.ini'])}",
        "command": lambda: f"{rng.choice(_WORDS)}ctl start --{rng.choice(['now', 'quiet', 'daemon'])}",
        "envvar": lambda: f"{rng.choice(_WORDS).upper()}_{rng.choice(['HOME', 'DATA_DIR', 'STATE', 'ROOT'])}",
        "address": lambda: f"127.0.{rng.randint(0, 9)}.{rng.randint(1, 254)}",
        "option": lambda: f"--{rng.choice(['verbose', 'debug', 'trace', 'loud', 'chatty'])}",
        "callsign": lambda: f"{rng.choice('KLMNOPQ')}{rng.choice('ABCDEFGH')}{rng.randint(100, 999)}",
        "email": lambda: f"{rng.choice(_FIRST).lower()}.{rng.choice(_LAST).lower()}@{rng.choice(_WORDS)}.example",
        "battery": lambda: rng.choice(["AA", "AAA", "9-volt", "CR2032", "18650"]),
        "goods": lambda: rng.choice(["grain", "timber", "spare parts", "wool", "salt", "olive oil", "water rights"]),
        "place": lambda: rng.choice(_PLACES),
    }
    if kind not in simple:
        raise ValueError(f"no values of kind {kind!r}")
    return simple[kind]()


@dataclass(frozen=True)
class Fact:
    family: Family
    subject: str
    value: str
    lead: str = ""  # words before the fact's sentence ("As of 2024, "): see `dress`
    trail: str = ""  # a clause after its value (", who signed the new berth contract")
    value_first: bool = False  # "Odile Varga is the manager of {s}.": see `put_value_first`

    @property
    def sentence(self) -> str:
        text = value_first_form(self.family.fact) if self.value_first else self.family.fact
        text = text.replace("{S}", self.subject[0].upper() + self.subject[1:])
        text = text.replace("{s}", self.subject).replace("{v}", self.value)
        if self.trail:
            text = f"{text[:-1]}{self.trail}{text[-1]}"
        if self.lead:
            text = self.lead + (text[0].lower() + text[1:] if text.startswith("The ") else text)
        return text

    def question(self, wording: str) -> str:
        return wording.replace("{s}", self.subject)


def draw_fact(family: Family, rng: random.Random) -> Fact:
    return Fact(family, subject(family.subject_kind, rng), value(family.value_kind, rng))


# ---- how documents word around a fact -----------------------------------------------------------------
#
# A family's fact sentence is one form of it; documents add to it: a time or a source before it ("As
# of 2024, the access code for the north warehouse is 31548."), a clause after its value ("The manager
# of the old mill is Odile Varga, who signed the new berth contract."). A dressing is such a (lead,
# trail) pair. The split is by kind: HELD_OUT_DRESSINGS are never trained on, and the `form` held-out
# set puts training families, asked in training wordings, in them only. Facts written value first
# are a form of their own (below).

DRESSINGS: tuple[tuple[str, str], ...] = (
    ("As of {year}, ", ""),
    ("According to the {month} notice, ", ""),
    ("At present, ", ""),
    ("Following the {month} review, ", ""),
    ("", ", as agreed in {year}"),
    ("", ", according to the {year} report"),
    ("", ", {rel} was confirmed in {month}"),
    ("In {year}, ", ", {rel} was checked on {weekday}"),
    ("Since {month}, ", ""),
    ("", " until further notice"),
    ("", ", {rel} signed the new {thing} contract"),
    ("For the record, ", ", as the notice at {place} says"),
)
HELD_OUT_DRESSINGS = DRESSINGS[-4:]
TRAIN_DRESSINGS = DRESSINGS[:-4]
_PERSON_VALUES = ("person", "persons")
_AGENT_VALUES = _PERSON_VALUES + ("company", "companies")  # what can sign a contract
_CONTRACTS = "berth|supply|cleaning|lease|catering|security".split("|")


def fits(fact: Fact, dressing: tuple[str, str]) -> bool:
    """Whether the dressing makes sense around the fact: only people and firms sign contracts."""
    return "signed" not in dressing[1] or fact.family.value_kind in _AGENT_VALUES


def dress_some(fact: Fact, dressings: tuple[tuple[str, str], ...], rng: random.Random) -> Fact:
    """The fact in one of the dressings that fit it (`fits`), drawn."""
    return dress(fact, rng.choice([d for d in dressings if fits(fact, d)]), rng)


def dress(fact: Fact, dressing: tuple[str, str], rng: random.Random) -> Fact:
    """The fact in a dressing, its blanks drawn ("who" after a person, "which" after anything else)."""
    blanks = {"year": str(rng.randint(2015, 2026)), "month": rng.choice(_MONTHS), "weekday": rng.choice(_WEEKDAYS),
              "thing": rng.choice(_CONTRACTS), "place": rng.choice(_PLACES),
              "rel": "who" if fact.family.value_kind in _PERSON_VALUES else "which"}
    lead, trail = dressing
    return dataclasses.replace(fact, lead=lead.format(**blanks), trail=trail.format(**blanks))


# ---- facts written value first --------------------------------------------------------------------------
#
# Documents also state a fact with its value as the subject of the sentence: "Odile Varga is the
# manager of the old mill." for "The manager of the old mill is Odile Varga.". Every family whose fact
# is "The <relation> is {v}." has that form, where its values can begin a sentence as they are (a
# name, a number; not "blue", which would have to become "Blue", no longer the answer's span). The
# table's families are never trained on it (the `value_first` held-out set asks training families, in
# training wordings, about facts in it only); generated families have it among their sentence forms,
# so training teaches the form on other relations.

_VALUE_LAST = re.compile(r"^The (?P<relation>[^{}]*\{s\}[^{}]*?) (?P<verb>is|are|was|were) \{v\}\.$")
# Value kinds whose values may begin with a small letter ("blue", "the old mill", "a nurse").
LOWER_CASE_VALUE_KINDS = frozenset(("colour", "colours", "command", "email", "food", "foods", "goods", "job",
                                    "licence", "packages", "place", "places", "word"))


def value_first_form(fact: str) -> str:
    """The fact sentence with its value first ("The manager of {s} is {v}." -> "{v} is the manager of
    {s}."); ValueError for a sentence not of the form "The <relation> is {v}."."""
    match = _VALUE_LAST.match(fact)
    if match is None:
        raise ValueError(f"{fact!r} cannot be put value first")
    return f"{{v}} {match['verb']} the {match['relation']}."


def can_put_value_first(family: Family) -> bool:
    return _VALUE_LAST.match(family.fact) is not None and family.value_kind not in LOWER_CASE_VALUE_KINDS


def put_value_first(fact: Fact) -> Fact:
    """The fact stated value first where its family's sentence allows, else as it is."""
    return dataclasses.replace(fact, value_first=True) if can_put_value_first(fact.family) else fact


# ---- lookup samples: facts placed in real text --------------------------------------------------------

@dataclass(frozen=True)
class LookupSample:
    """A document (real text with facts placed in it) and one question about it."""
    document: str
    question: str
    answer: str  # the value, or NOT_FOUND
    family: str  # the asked family's id
    wording: str  # "plain" | "paraphrase"
    framing: str
    depth: float  # where the asked fact sits, 0 (start) to 1 (end); -1 when not in the document
    held_out: str = ""  # what of it training never saw: "family", "paraphrase" or "framing"
    # The asked fact's sentence ("" when it is not in the document): the answer's value may also
    # stand in another subject's fact (values are drawn from small pools), so only this tells
    # where the answer is.
    fact: str = ""


def place_facts(paragraphs: list[str], facts: list[Fact], depths: list[float]) -> str:
    """The paragraphs with each fact's sentence appended to the paragraph at its depth."""
    out = list(paragraphs)
    for fact, depth in zip(facts, depths, strict=True):
        at = min(int(depth * len(out)), len(out) - 1)
        out[at] = f"{out[at]} {fact.sentence}"
    return "\n\n".join(out)


def lookup_sample(paragraphs: list[str], families_: list[Family], wordings: dict[str, tuple[str, ...]],
                  framings: tuple[str, ...], rng: random.Random, distractors: int = 2,
                  answerable: bool = True, dressings: tuple[tuple[str, str], ...] = (),
                  value_first: bool = False) -> LookupSample:
    """One question about one fact in real text, with `distractors` facts of other families beside it
    (and one of the same family about another subject, so the subject has to be read). Unanswerable:
    the asked subject is not in the document (its family's facts about other subjects are).
    `dressings`: each placed fact is put in one of them (`dress`); `value_first`: each placed fact
    that can be is stated value first (`put_value_first`)."""
    family = rng.choice(families_)
    asked = draw_fact(family, rng)
    same_family_other = draw_fact(family, rng)
    while same_family_other.subject == asked.subject:
        same_family_other = draw_fact(family, rng)
    others = [draw_fact(rng.choice(families_), rng) for _ in range(distractors)]
    if dressings:
        asked, same_family_other, *others = (dress_some(f, dressings, rng) for f in (asked, same_family_other, *others))
    if value_first:
        asked, same_family_other, *others = (put_value_first(f) for f in (asked, same_family_other, *others))
    placed = ([asked] if answerable else []) + [same_family_other] + others
    depths = [rng.random() for _ in placed]
    wording_text = rng.choice(wordings[family.id])
    wording = "plain" if wording_text == family.question else "paraphrase"
    framing = rng.choice(framings)
    return LookupSample(document=place_facts(paragraphs, placed, depths),
                        question=frame(asked.question(wording_text), framing),
                        answer=asked.value if answerable else NOT_FOUND, family=family.id, wording=wording,
                        framing=framing, depth=depths[0] if answerable else -1.0,
                        fact=asked.sentence if answerable else "")


def held_out_samples(paragraph_pool: list[list[str]], n: int, seed: int, no_answer_share: float = 0.0,
                     kind: str | None = None) -> list[LookupSample]:
    """The held-out lookup set, always in held-out framings. `kind` says what else is new to the model:
    "family" (a held-out family, any wording), "paraphrase" (a training family's held-out
    paraphrase), "framing" (a training family in a training wording: only the framing is new) or
    "form" (as "framing", the facts in held-out dressings) or "value_first" (as "framing", about facts
    stated value first, `put_value_first`); None takes the first three in turn."""
    sp = split()
    trained = [(f, sp.train_wordings(f)) for f in sp.train_families if not sp.held_out_wordings(f)]
    pools = {"family": [(f, sp.held_out_wordings(f)) for f in sp.held_out_families],
             "paraphrase": [(f, sp.held_out_wordings(f)) for f in sp.train_families if sp.held_out_wordings(f)],
             "framing": trained, "form": trained,
             "value_first": [(f, w) for f, w in trained if can_put_value_first(f)]}
    if kind is not None and kind not in pools:
        raise ValueError(f"unknown held-out kind {kind!r}")
    rng = random.Random(seed)
    out = []
    for i in range(n):
        this = kind or ("family", "paraphrase", "framing")[i % 3]
        pool = pools[this]
        sample = lookup_sample(rng.choice(paragraph_pool), [f for f, _ in pool], {f.id: w for f, w in pool},
                               sp.held_out_framings, rng, answerable=rng.random() >= no_answer_share,
                               dressings=HELD_OUT_DRESSINGS if this == "form" else (),
                               value_first=this == "value_first")
        out.append(dataclasses.replace(sample, held_out=this))
    return out


# ---- generated families: many more relations than the table, for training only -----------------------
#
# The table's 164 training families teach the reading of a fact, but a model that has seen only they
# may bind a question to the few predicates it knows. Generated families compose a relation from a
# modifier and a head ("billing" + "code": "The billing code of the Tarn depot is 48213.") in several
# sentence forms and question wordings, thousands in all. None uses a modifier and head that a held-out
# family's fact or questions hold together (`generated_family` checks), so the held-out families stay
# unseen.

_MODIFIERS = ("backup billing booking cargo catalogue clearance customs delivery dispatch emergency export filing "
              "harbour import insurance intake inventory invoice locker maintenance member night parcel patrol "
              "permit registration repair reserve routing security serial shipping signal storage supply survey "
              "tender tracking transfer visitor voucher warranty archive audit calibration compliance courier "
              "depot freight grant hazard kitchen laboratory ledger library loading metering payroll pension "
              "quality radio recycling research safety sampling seasonal service staff testing training transit "
              "utility ventilation water welfare workshop").split()
# head | value kind | "what" questions or "who" / "when" / "how much" ones
_HEADS = (("code", "code", "what"), ("number", "code", "what"), ("reference", "code", "what"),
          ("password", "word", "what"), ("keyword", "word", "what"), ("officer", "person", "who"),
          ("supervisor", "person", "who"), ("coordinator", "person", "who"), ("contact", "person", "who"),
          ("inspector", "person", "who"), ("deadline", "date", "when"), ("review date", "date", "when"),
          ("limit", "count", "what"), ("quota", "count", "what"), ("fee", "money", "how much"),
          ("allowance", "money", "how much"), ("start time", "time", "when"), ("colour", "colour", "what"),
          ("supplier", "company", "what"), ("office", "city", "what"), ("version", "version", "what"),
          ("port", "port", "what"), ("directory", "path", "what"), ("address", "address", "what"))
_GENERATED_FACTS = ("The {a} of {s} is {v}.", "The {a} for {s} is {v}.", "For {s}, the {a} is {v}.",
                    "{S} lists {v} as its {a}.", "{S} has {v} as its {a}.", "The current {a} of {s} is {v}.")
_GENERATED_VALUE_FIRST_FACTS = ("{v} is the {a} of {s}.", "{v} is the current {a} for {s}.")
_GENERATED_QUESTIONS = {
    "what": ("What is the {a} of {s}?", "What is the {a} for {s}?", "Which {a} does {s} have?",
             "What {a} does {s} use?", "Give me the {a} of {s}."),
    "who": ("Who is the {a} of {s}?", "Who is the {a} for {s}?", "Who serves as {a} for {s}?",
            "Which person is the {a} of {s}?", "Name the {a} of {s}."),
    "when": ("When is the {a} of {s}?", "What is the {a} for {s}?", "At what time or date is the {a} of {s}?",
             "When is the {a} for {s}?", "Give me the {a} of {s}."),
    "how much": ("How much is the {a} of {s}?", "What is the {a} for {s}?", "How much is the {a} for {s}?",
                 "What does the {a} of {s} come to?", "Give me the {a} of {s}."),
}
_GENERATED_SUBJECT_KINDS = tuple(_SUBJECT_NOUNS)


def _held_out_word_sets(sp: Split) -> list[set[str]]:
    """The words of each held-out family's fact and questions, lower-cased."""
    return [set(re.findall(r"[a-z]+", " ".join((f.fact, f.question, *f.paraphrases)).lower()))
            for f in sp.held_out_families]


def generated_relations(sp: Split) -> list[tuple[str, str, str]]:
    """Every (relation, value kind, question kind) the generated families may use: each modifier with
    each head, less those whose words all stand together in one held-out family."""
    held = _held_out_word_sets(sp)
    out = []
    for head, kind, asks in _HEADS:
        for modifier in _MODIFIERS:
            words = {modifier, *head.split()}
            if not any(words <= h for h in held):
                out.append((f"{modifier} {head}", kind, asks))
    return out


def generated_family(relation: tuple[str, str, str], rng: random.Random) -> Family:
    """One generated family of `relation` (from `generated_relations`): a sentence form and every
    question wording of its kind."""
    name, kind, asks = relation
    forms = _GENERATED_FACTS + (_GENERATED_VALUE_FIRST_FACTS if kind not in LOWER_CASE_VALUE_KINDS else ())
    fact = rng.choice(forms).replace("{a}", name)
    questions = tuple(q.replace("{a}", name) for q in _GENERATED_QUESTIONS[asks])
    subject_kind = rng.choice(_GENERATED_SUBJECT_KINDS)
    return Family(f"generated/{name}", subject_kind, fact, questions[0], questions[1:], kind)
