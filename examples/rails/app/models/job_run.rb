class JobRun < ApplicationRecord
end
