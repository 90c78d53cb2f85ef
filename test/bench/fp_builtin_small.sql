-- what a user would write without the extension (neither canonical nor
-- number-normalizing), on the small body
SELECT sha256(convert_to(body::text, 'UTF8')) FROM bench_bodies WHERE name = 'small';
