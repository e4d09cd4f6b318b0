"""Fixed text the synthetic tokenizers learn their merges from.

Built into the code (not downloaded) so a test checkpoint is the same on every machine. The
English part covers the words Laya's sequence construction always emits (`choice question:`,
`level 0:`, `false: no, the statement does not hold` ...) and JSON punctuation, so typical
requests tokenise into multi-character pieces as a real vocabulary would; the multilingual
part gives the Gemma-style tokenizer pieces in several scripts.
"""

ENGLISH = """
choice question: score question: noul question: level 0: level 1: level 2: level 3: level 4:
false: no, the statement does not hold. true: yes, the statement holds.
Is the customer asking for a refund? Which department should handle this ticket?
How urgent is the request? Rate the sentiment of the message from very negative to very positive.
The customer wrote that the order arrived late and the package was damaged during shipping.
I would like to cancel my subscription and get my money back as soon as possible, thank you.
Please reset my password, I cannot log in to my account since yesterday evening.
The invoice shows the wrong amount and the billing address is not correct.
Our team will review your message and respond within two business days.
The user says the application crashes when they open the settings page on their phone.
We shipped the replacement item today; the tracking number is in the email we sent you.
Hello, I have a question about the pricing of the enterprise plan and the support options.
The agent answered politely but the problem was not solved, and the customer is frustrated.
Summarise the conversation. Does the message contain personal data such as an email address?
{"role": "user", "content": "Where is my order?"}, {"role": "assistant", "content": "Let me check."}
{"name": "Alice", "age": 34, "country": "United States", "items": [1, 2, 3], "paid": true}
billing, shipping, technical, account, sales, other, low, medium, high, critical, spam, legal.
The weather is nice today and the meeting was moved to Thursday afternoon at three o'clock.
A decision model reads a state and answers typed questions with calibrated probabilities.
Product, feature, bug, error, issue, problem, request, complaint, praise, feedback, review.
positive negative neutral angry happy sad confused satisfied unsatisfied urgent routine.
The quick brown fox jumps over the lazy dog. 0123456789 - + * / = < > ( ) [ ] { } " ' : ; , . ! ?
"""

MULTILINGUAL = ENGLISH + """
Le client demande un remboursement parce que la commande est arrivée en retard.
Bonjour, je voudrais annuler mon abonnement et récupérer mon argent, merci beaucoup.
Der Kunde möchte sein Passwort zurücksetzen, weil er sich nicht anmelden kann.
Die Rechnung zeigt den falschen Betrag und die Lieferung war beschädigt.
El cliente pregunta por el precio del plan empresarial y las opciones de soporte.
Hola, mi pedido no ha llegado todavía y necesito ayuda urgente, por favor.
O cliente está satisfeito com o produto, mas a entrega demorou muito.
Il cliente chiede un rimborso perché il pacco è arrivato danneggiato.
Клиент просит вернуть деньги, потому что заказ пришёл поздно и был повреждён.
Здравствуйте, я не могу войти в свой аккаунт со вчерашнего вечера.
お客様は注文が遅れて届いたので返金を求めています。パスワードをリセットしてください。
客户要求退款，因为订单迟到了，包裹在运输途中损坏了。请尽快处理。
고객이 주문이 늦게 도착해서 환불을 요청하고 있습니다.
ग्राहक रिफंड मांग रहा है क्योंकि ऑर्डर देर से पहुंचा।
العميل يطلب استرداد المال لأن الطلب وصل متأخرا.
Müşteri siparişin geç geldiğini ve para iadesi istediğini söylüyor.
Klient prosi o zwrot pieniędzy, ponieważ zamówienie dotarło uszkodzone.
"""
