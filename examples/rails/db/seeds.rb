# Ten posts for GET /db (idempotent).
(1..10).each do |i|
  Post.find_or_create_by!(title: "Seeded post #{i}") { |post| post.body = "Body of post #{i}." }
end
