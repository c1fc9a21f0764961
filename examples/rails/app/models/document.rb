# An uploaded file kept by Active Storage (the disk service in storage/).
class Document < ApplicationRecord
  has_one_attached :file
end
