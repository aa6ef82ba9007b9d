-- description: Who covered which company for which firm, from when to when: one row per analyst, firm and covered company, from the calls' participants lists. first_call/last_call are the calls they were listed on; left_firm_at is the first later call that lists them at another firm (NULL while no call does); titles are the titles they were listed with.
-- upstream_assets: invalidated_events
CREATE OR REPLACE VIEW analyst_coverage AS
WITH listed AS (
    SELECT * FROM raw.position_listings WHERE NOT corporate
), coverage AS (
    SELECT person_id, any_value(person) AS analyst, firm_key, arg_max(firm, call_at) AS firm, company,
           min(call_at)::DATE AS first_call, max(call_at)::DATE AS last_call, count(DISTINCT call_at) AS calls,
           list(DISTINCT title ORDER BY title) AS titles
    FROM listed
    GROUP BY person_id, firm_key, company
)
SELECT c.analyst, c.person_id, c.firm, c.company, c.first_call, c.last_call, c.calls, c.titles,
       (SELECT min(o.call_at)::DATE FROM listed AS o
        WHERE o.person_id = c.person_id AND o.firm_key <> c.firm_key AND o.call_at::DATE > c.last_call) AS left_firm_at
FROM coverage AS c
ORDER BY c.company, c.analyst, c.first_call;
